"""A Kubernetes API simulator for tests: the real ``kubernetes`` client talks HTTP to it.

    store        objects, resourceVersion, watch history, selectors, merge/JSON patches
    api          REST paths, watch streams, Status errors, proxy/log subresources, discovery
    controllers  Deployments, Jobs, garbage collection, GKE pod snapshots
    kubelet      scheduling, pods as local processes on 127.77.x.y, probes, restarts
    images       which local program an image reference runs (stand-ins)
    sim          wiring and the ``/_sim`` test hooks;  ``python -m tests.k8s_sim`` runs it
    fixtures     ``SimulatorProcess`` and the ``k8s_sim`` / ``k8s_config`` pytest fixtures

What it cannot show (image pulls, real scheduling, isolation, the image builder's run, GKE's
checkpoint itself, DNS, timings at scale) is listed in docs/kubernetes.md.
"""
