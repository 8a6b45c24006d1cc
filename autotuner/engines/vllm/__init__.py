"""The vLLM engine adapter: launcher, metric names, defaults, reserved flags, deploy renderer."""
