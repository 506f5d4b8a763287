"""Runs that span machines on Ray (``pip install 'agentrl[ray]'``, the ``ray`` config section).

The same config and plugins as a one-host run; Ray places the roles by resources:

* trainer processes (:mod:`agentrl.cluster.trainers`): process 0 where ``agentrl train`` runs (it
  writes the run dir), the others as actors that each run the same command with torch.distributed
  rendezvous variables, so they form one process group across nodes (gloo on CPUs, NCCL on GPUs);
* engine replicas (:mod:`agentrl.cluster.engines`): the config's engine in actors, each with its own
  copy of the weights, sent through Ray's object store after every update;
* env workers (:mod:`agentrl.cluster.envs`): actors running the envs' ``reset``/``step``.

:mod:`agentrl.cluster.runtime` joins or starts the cluster and turns a role's resources into actor
options. Nothing here is imported by a one-host run.
"""
