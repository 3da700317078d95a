"""Pure planning: spec + profile -> JobPlan (rules, memory estimates, DeepSpeed/NCCL/environment, the Jinja environment)."""
