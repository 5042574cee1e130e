"""`agl train --on kubernetes`: provisioning the RL backend on a cluster, watching it, and tearing it down.

The pieces, in the order a provision runs them:

- options.py    what the user asked for (ProvisionOptions), the train's names and labels, ProvisionError
- trainer_args.py  the training flags passed through to the trainer, checked first
- bundle.py     where rollout pods get the agent (its image, or the shipped project) and which code must ship
- target.py     what the provision needs from agl.yaml (TrainTarget): upstream key references, the files to carry,
                the cluster's copy of agl.yaml
- plan.py       the render context: trainer topology (Job or KubeRay RayJob, nodes, GPUs per node), env, volumes
- render.py     jinja2 templates (templates/k8s/provision/) -> manifests, each validated offline; no secret inside
- rayjob_schema.py  a RayJob checked against KubeRay's CRD schema (schemas/rayjob-v1.json) and Kubernetes' own
- resources.py  the official client per kind: create, read, patch, delete, list (objects stay the API's JSON)
- apply.py      create-or-patch in dependency order, roll back what this run created on failure; stop by label
- readiness.py  pure checks on objects: ready or not, and why (ImagePullBackOff, Unschedulable, CrashLoopBackOff)
- wait.py       polling the readiness checks with a progress display, diagnosing a failure with events and logs
- metric_rows.py  the trainer's step rows in the train's metrics ConfigMap: the trainer's writer, the reader's parse
- metrics.py    following the step rows (the ConfigMap's; the log's for a train planned by an older agl)
- status.py     `agl train status`: the train's objects, their readiness, its last metrics
- session.py    the whole sequence: provision (dry run or applied, waited for, followed) and stop

Nothing here imports `kubernetes` at module level: the client (the `k8s` extra) loads when a cluster is used.
"""
