"""Server configuration: the YAML files in this folder and the loader that validates them."""

from .loader import load_config
from .schema import (
    AuthConfig,
    ConfigError,
    FailoverConfig,
    Limits,
    ManagementConfig,
    PeerTls,
    ReplicationConfig,
    ServerConfig,
    StoreConfig,
    TlsListener,
    User,
)

__all__ = [
    "AuthConfig",
    "ConfigError",
    "FailoverConfig",
    "Limits",
    "ManagementConfig",
    "PeerTls",
    "ReplicationConfig",
    "ServerConfig",
    "StoreConfig",
    "TlsListener",
    "User",
    "load_config",
]
