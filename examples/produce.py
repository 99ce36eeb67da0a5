"""A steady mixed workload for the compose kit: ``python -m examples.produce [RATE]``.

Publishes ``RATE`` tasks a second (default 2) until stopped: short CPU tasks for acme and
globex and GPU tasks for globex, each tenant named by the ``aitp_tenant`` header.
"""

from __future__ import annotations

import random
import sys
import time

from examples.proj import resize, train


def main(rate: float = 2.0) -> None:
    pace = 1.0 / rate
    while True:
        tenant = random.choice(["acme", "acme", "globex"])
        if random.random() < 0.2:
            train.apply_async((random.randint(1_000, 50_000),), headers={"aitp_tenant": "globex"})
        else:
            resize.apply_async((random.randint(64, 4096), random.randint(64, 4096)),
                               headers={"aitp_tenant": tenant})
        time.sleep(pace)


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 2.0)
