"""Self-distillation data shared by every learned drafter: prompts, the target's answers, the store."""
