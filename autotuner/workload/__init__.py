"""What requests a load test sends: lengths, prompts, datasets and traces."""
