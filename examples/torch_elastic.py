"""Elastic training with dlcomm (Horovod's ``hvd.elastic`` API): the script is
``dlcomm/tools/faults/elastic_digits.py``, shipped in the package so that ``dlcomm faults``
can train it. Run it with::

    dlcommrun --min-np 2 --max-np 4 python examples/torch_elastic.py --json out.json
"""
from dlcomm.tools.faults.elastic_digits import main

if __name__ == "__main__":
    main()
