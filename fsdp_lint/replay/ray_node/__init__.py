"""The node's Ray cluster, in the replay's own process (`modules.install`).

RL and data frameworks (verl and the many projects built on it, and others like it) start Ray from a plain
``python`` process and build their FSDP models inside Ray actors: ``ray.init()``, a placement group of the
node's GPUs, ``Worker.options(runtime_env={"env_vars": {"RANK": ..., "WORLD_SIZE": ...}}).remote()`` per GPU,
then ``ray.get([w.init_model.remote() for w in workers])``. A real Ray would start a cluster of processes the
replay cannot follow (and that outlive it). The simulated node has a Ray of its own, in the replay's process,
whether or not Ray is installed here (`install`, for the replay only):

* ``ray.init`` / ``is_initialized`` / ``shutdown``; the cluster is one node with the node's GPUs
  (``gpus-per-node``, or the ``num_gpus=`` given to ``ray.init``): ``ray.nodes()``, ``cluster_resources()``,
  placement groups that are ready at once (one asking for more GPUs than the node has is refused, where a
  real cluster would wait for ever);
* a remote function runs when it is called (``f.remote(x)``); its result, or its error, is in the
  ``ObjectRef`` that ``ray.get`` returns or raises;
* an actor's constructor and methods run in this process, with the environment its process has on a node:
  the driver's, plus ``ray.init``'s and the actor's ``runtime_env`` ``env_vars``, plus what the actor sets
  itself (kept between its calls, never leaking into the driver);
* the first actor of a class is the one replayed (rank 0 of its group); each further actor of that class
  (ranks 1..N-1 of a worker group, which the replay does not run) answers a call with what the first
  answered to the same call;
* what this Ray does not simulate (``ray.data``, ``ray.train``, ``ray.serve``, ...) cannot be imported, and
  says so: the replay stands it in or names it as the cause, as for a package that is not installed.

The steps: ``cluster`` (what ``ray.init`` made; object refs and how a task runs), ``actors`` (remote functions,
actor classes, handles), ``api`` (the ``ray.*`` functions, placement groups, the runtime context), ``modules``
(the ``ray`` modules, the finder for the rest, `install`), ``train`` (Ray Train's ``TorchTrainer`` and
``prepare_model``).
"""
