"""FedLog on digits under three layers: same statistics, different views for the server.

Run: python examples/fedlog_digits.py
"""

from algorithms import FedLog
from secagg import Federation, Plaintext
from secagg.audit import audit
from secagg.data import dirichlet_split, load_dataset


def main() -> None:
    clients = dirichlet_split(load_dataset("digits"), n_clients=10, alpha=0.5, seed=0,
                              local_test_fraction=0.2)
    layers = [Plaintext()]
    try:
        from secagg.secure_sum import SecureSum

        layers.append(SecureSum(threshold=0.7))
    except ImportError:
        pass
    for layer in layers:
        result = Federation(FedLog(), layer, clients, rounds=5, seed=0).run()
        print(f"\n== {layer.name}: {result.accuracy_kind} accuracy {result.accuracy:.4f}")
        print(result.costs.format_summary())
        for entry in audit(result.transcript)["fields"]:
            print(f"  field {entry['field']!r}: server saw {entry['server_saw']}")


if __name__ == "__main__":
    main()
