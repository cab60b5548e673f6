"""The broker's model: messages, exchanges and routing, queues and delivery, vhosts.

Pure: no sockets, no event loop, no clock (time is passed in), no logging.
"""
