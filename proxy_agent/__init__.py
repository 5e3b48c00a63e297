"""proxy-agent: a resource-manager proxy agent speaking the proxy protocol."""

__version__ = "0.1.0"
