"""Work split over every core this process may use, with progress lines.

The Section 3 construction (`construction`) spends its time in NumPy
products on independent blocks of points. NumPy releases the GIL inside
them, so threads run them in parallel; the caller keeps the BLAS itself
single-threaded (//bin:construct sets OPENBLAS_NUM_THREADS=1), one thread per
core.
"""

import concurrent.futures
import threading
import time

from identity_tf import machine

# A progress line at most this often (seconds).
PROGRESS_SECONDS = 10.0


def map_with_progress(function, items, log=None, describe=None, size=None):
  """[FUNCTION(item) for item in ITEMS], on `machine.available_cores()` threads.

  The results come back in the order of ITEMS whichever thread computed
  them, and each call sees only its own item: the result does not depend on
  the number of cores. When LOG is given it receives DESCRIBE(done, total) at
  most every PROGRESS_SECONDS, counting SIZE(item) per finished item
  (default 1).
  """
  items = list(items)
  size = size or (lambda item: 1)
  describe = describe or (lambda done, total: f"  {done}/{total}")
  total = sum(size(item) for item in items)
  progress = {"done": 0, "time": time.monotonic()}
  lock = threading.Lock()

  def run(item):
    result = function(item)
    with lock:
      progress["done"] += size(item)
      if log and time.monotonic() - progress["time"] > PROGRESS_SECONDS:
        log(describe(progress["done"], total))
        progress["time"] = time.monotonic()
    return result

  workers = max(1, min(machine.available_cores(), len(items)))
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    return list(pool.map(run, items))
