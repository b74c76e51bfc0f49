"""Training the clone controller: samples from traces, credit assignment, GRPO, the trainer."""
