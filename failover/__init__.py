"""Failover: the pure active/passive state machine, the signed state message, the heartbeat
thread, the asyncio controller, the epoch store and the event log (docs/failover.md)."""
