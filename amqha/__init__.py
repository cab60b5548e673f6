"""amqha: an AMQP 0-9-1 broker that runs as a primary/backup high-availability pair."""

from . import compiled

__version__ = "0.1.0"

# The hot modules from their mypyc build when it matches their sources (amqha/compiled.py).
compiled.install()
