"""The management HTTP API (RabbitMQ's) and the pair's web page.

``access``: who may see and do what (pure); ``shapes``: the JSON from the broker's model
(pure); ``definitions``: definitions.json export and import; ``api``: the aiohttp
listener. See docs/operations.md, "Management API".
"""
