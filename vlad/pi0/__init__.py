"""A π0-sized release built from the latency planner's description: the model (`vlad.pi0.model`) and the signed release (`vlad.pi0.release`)."""
