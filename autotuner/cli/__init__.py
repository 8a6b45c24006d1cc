"""The command line: argument parsing, one handler per command, one error wrapper."""
