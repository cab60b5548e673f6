"""Server configuration: the YAML files in this folder and the loader that validates them."""

from .loader import (
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
    load_config,
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
