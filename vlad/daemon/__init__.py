"""The daemon (``vlad serve``): the supervisor (:mod:`~vlad.daemon.supervisor`), its sockets
(:mod:`~vlad.daemon.sockets`), the e-stop thread (:mod:`~vlad.daemon.safety`), the policy
chain (:mod:`~vlad.daemon.chain`), the health service (:mod:`~vlad.daemon.health`), live
release operations (:mod:`~vlad.daemon.releases`), the control server and its commands
(:mod:`~vlad.daemon.control`), status (:mod:`~vlad.daemon.status`) and the systemd notify
protocol (:mod:`~vlad.daemon.systemd`)."""
