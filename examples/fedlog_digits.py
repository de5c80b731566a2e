"""FedLog on digits under three layers: same statistics, different views for the server.

Plaintext (the server sees every client's statistics), SecureSum (it sees only their sum)
and DistributedDP over SecureSum (it sees only a noised sum: record-level epsilon 2). Under
DP, FedLog takes the defaults the command line applies (``FedLog.dp_defaults``: one
release of the untrained bodies' statistics, features scaled to a fixed norm).

Run: python examples/fedlog_digits.py
"""

from algorithms import FedLog
from secagg import DistributedDP, Federation, Plaintext, SecureSum
from secagg.audit import audit
from secagg.data import dirichlet_split, load_dataset


def main() -> None:
    clients = dirichlet_split(load_dataset("digits"), n_clients=10, alpha=0.5, seed=0,
                              local_test_fraction=0.2)
    runs = [
        (FedLog(), Plaintext()),
        (FedLog(), SecureSum(threshold=0.7)),
        (FedLog(**FedLog.dp_defaults("record", {})),
         DistributedDP(SecureSum(threshold=0.7), epsilon=2.0, delta=1e-5)),
    ]
    for algorithm, layer in runs:
        result = Federation(algorithm, layer, clients, rounds=5, seed=0).run()
        print(f"\n== {layer.name}: {result.accuracy_kind} accuracy {result.accuracy:.4f}")
        print(result.costs.format_summary())
        for entry in audit(result.transcript)["fields"]:
            print(f"  field {entry['field']!r}: server saw {entry['server_saw']}")


if __name__ == "__main__":
    main()
