"""Server configuration: the YAML files in this folder and the loader that validates them."""

from .loader import ConfigError, FailoverConfig, Limits, ServerConfig, User, load_config

__all__ = ["ConfigError", "FailoverConfig", "Limits", "ServerConfig", "User", "load_config"]
