"""Model backends behind one batched protocol."""
