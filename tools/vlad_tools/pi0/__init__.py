"""A π0-sized release built from the latency planner's description: the model (`vlad_tools.pi0.model`) and the signed release (`vlad_tools.pi0.release`)."""
