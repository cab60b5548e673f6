"""amqha: an AMQP 0-9-1 broker that runs as a primary/backup high-availability pair."""

__version__ = "0.1.0"
