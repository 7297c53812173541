import pytest
import torch

from training.losses import MemoryBank


def oldest_first(bank: MemoryBank) -> torch.Tensor:
    """The bank's rows in arrival order: its ring buffer read from the head once it has wrapped."""
    if len(bank) < bank.capacity:
        return bank.data[: len(bank)]
    return torch.cat([bank.data[int(bank.head) :], bank.data[: int(bank.head)]])


def rows(*values: float) -> torch.Tensor:
    return torch.tensor([[v, -v] for v in values])


def test_fifo_order_and_size() -> None:
    bank = MemoryBank(capacity=4, dim=2)
    assert len(bank) == 0 and oldest_first(bank).shape == (0, 2)
    bank.enqueue(rows(0, 1, 2))
    assert len(bank) == 3
    assert torch.equal(oldest_first(bank), rows(0, 1, 2))
    bank.enqueue(rows(3, 4, 5))  # wraps: 0 and 1 leave first
    assert len(bank) == 4
    assert torch.equal(oldest_first(bank), rows(2, 3, 4, 5))
    bank.enqueue(rows(6))
    assert torch.equal(oldest_first(bank), rows(3, 4, 5, 6))
    # order-free view: same rows, storage order
    assert sorted(bank.vectors()[:, 0].tolist()) == [3.0, 4.0, 5.0, 6.0]


def test_batch_larger_than_capacity_keeps_the_newest() -> None:
    bank = MemoryBank(capacity=3, dim=2)
    bank.enqueue(rows(0))
    bank.enqueue(rows(1, 2, 3, 4, 5))
    assert len(bank) == 3
    assert torch.equal(oldest_first(bank), rows(3, 4, 5))
    bank.enqueue(rows(6, 7))
    assert torch.equal(oldest_first(bank), rows(5, 6, 7))


def test_enqueue_detaches_and_casts() -> None:
    bank = MemoryBank(capacity=2, dim=2)
    source = rows(1.0).double().requires_grad_(True)
    bank.enqueue(source * 2)
    stored = oldest_first(bank)
    assert not stored.requires_grad and stored.dtype == torch.float32
    assert torch.equal(stored, rows(2.0))


def test_state_dict_round_trip_resumes_the_same_order() -> None:
    bank = MemoryBank(capacity=3, dim=2)
    bank.enqueue(rows(0, 1, 2, 3))
    bank.enqueue(rows(4))
    restored = MemoryBank(capacity=3, dim=2)
    restored.load_state_dict(bank.state_dict())
    assert torch.equal(oldest_first(restored), oldest_first(bank))
    bank.enqueue(rows(5))
    restored.enqueue(rows(5))
    assert torch.equal(oldest_first(restored), rows(3, 4, 5))
    assert torch.equal(oldest_first(restored), oldest_first(bank))


def test_follows_module_moves_and_rejects_bad_shapes() -> None:
    bank = MemoryBank(capacity=2, dim=2).to(torch.float64)
    bank.enqueue(rows(1.0))
    assert oldest_first(bank).dtype == torch.float64
    with pytest.raises(ValueError, match=r"expected \(n, 2\)"):
        bank.enqueue(torch.zeros(3))
    with pytest.raises(ValueError, match="positive"):
        MemoryBank(capacity=0, dim=2)
