"""kvpool-operator: moves GPU memory between the kvpools of models colocated on one GPU.

So far: the pure rebalancing policy (:mod:`kvpool_operator.policy`). The kopf handlers, the
workload builders and the custom resource come next (issue 6). Never imports torch or vLLM."""
