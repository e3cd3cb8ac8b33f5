"""The two engines that run spec 001's steps: ``inline`` (one process, under the shard lock) and
``pipeline`` (a pass under the shard lock, its expensive steps done by RabbitMQ stage workers)."""
