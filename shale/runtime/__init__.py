"""What a process running Shale's work needs of its surroundings, below every other package:
interrupts (:mod:`shale.runtime.interrupts`: the first SIGINT cancels pending work, the run
cleans up), how many CPUs it may use (:mod:`shale.runtime.cpus`, cgroup-aware) and byte-rate
limits (:mod:`shale.runtime.throttle`)."""

__all__: list[str] = []
