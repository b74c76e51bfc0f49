"""Multi-hop QA task sources."""
