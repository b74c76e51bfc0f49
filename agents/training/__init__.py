"""Training the clone controller: samples from traces, credit assignment, GRPO, the trainer,
and adapters to TRL and verl (import package ``selfcest_env.agents.training``, folder
``agents/training/``)."""
