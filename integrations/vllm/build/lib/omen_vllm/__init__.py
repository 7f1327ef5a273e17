"""omen's vLLM plugin: pushes the KV block pool's state to an omen agent.

vLLM loads it through the ``vllm.general_plugins`` entry point (see ``plugin.register``);
settings come from environment variables (see ``config.Settings``).
"""

__version__ = "0.1.0"
