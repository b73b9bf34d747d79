"""One claimed job from its start to its durable outcome: its state, its run, its watch, its decision, its writer."""
