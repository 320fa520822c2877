"""kvpool-operator: moves GPU memory between the kvpools of models colocated on one GPU.

``spec`` and ``crd`` (the ColocatedModels resource; ``podspec`` its workload's pod overlay, model
volume and Hugging Face, ``fields`` the typed JSON readers below both), ``policy`` (the pure rebalancing policy),
``wire`` and ``pools`` (the admin API, typed, behind the ``AdminAPI`` seam), ``balance`` (one
round per pod), ``builders`` (the workload's manifests), ``handlers`` (kopf), ``status``,
``metrics``, ``rbac``. Never imports torch, vLLM or kvpool: it speaks the admin API only."""
