"""The node's per-queue locks: exclusive per queue, and forgotten once nobody holds or
waits for them (a node that sees many queue names come and go must not keep a lock each)."""

from __future__ import annotations

import asyncio

from zdmq.server.node import QueueLocks


def test_one_holder_per_queue_and_other_queues_do_not_wait() -> None:
    async def main() -> list[str]:
        locks, log = QueueLocks(), []

        async def hold(queue: str, name: str, pause: float) -> None:
            async with locks(queue):
                log.append(f"{name} in")
                await asyncio.sleep(pause)
                log.append(f"{name} out")

        await asyncio.gather(hold("q", "a", 0.05), hold("q", "b", 0.0), hold("r", "c", 0.0))
        assert len(locks) == 0
        return log

    log = asyncio.run(main())
    # b waits for a on the same queue; c, on another queue, gets in while a holds "q".
    assert log.index("a out") < log.index("b in")
    assert log.index("c in") < log.index("a out")


def test_locks_are_forgotten_after_many_queues() -> None:
    async def main() -> int:
        locks = QueueLocks()
        for i in range(1000):
            async with locks(f"queue-{i}"):
                await asyncio.sleep(0)
        return len(locks)

    assert asyncio.run(main()) == 0


def test_a_cancelled_waiter_leaves_the_lock_working_and_forgotten() -> None:
    async def main() -> None:
        locks = QueueLocks()
        release = asyncio.Event()

        async def holder() -> None:
            async with locks("q"):
                await release.wait()

        async def waiter() -> None:
            async with locks("q"):
                raise AssertionError("a cancelled waiter never gets the lock")

        first = asyncio.create_task(holder())
        await asyncio.sleep(0)
        second = asyncio.create_task(waiter())
        await asyncio.sleep(0)
        assert len(locks) == 1
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)
        assert len(locks) == 1  # the holder still holds it
        release.set()
        await first
        assert len(locks) == 0
        async with asyncio.timeout(1):  # and the queue can be locked again
            async with locks("q"):
                assert len(locks) == 1
        assert len(locks) == 0

    asyncio.run(main())
