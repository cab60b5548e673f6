"""Failover: the pure active/passive state machine, its asyncio controller, the epoch store
and the event log (DESIGN.md §3-§5)."""
