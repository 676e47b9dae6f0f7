# Optional parts of ddp, each an INTERFACE target a consumer links when it uses that part.
#   ddp::ddp    core: concepts, policies, in-process ranks, host device, trainer
set(ddp_installed_targets ddp)
