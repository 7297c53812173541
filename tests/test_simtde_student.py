import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from distilembed.errors import UserError
from training.simtde_student import (
    build_simtde_student,
    factorise_embeddings,
    simtde_encoder,
    simtde_forward,
    teacher_token_embedder,
    teacher_token_embeddings,
    token_weights,
)

WIDTH, LAYERS, KEEP, TOKEN_DIM = 32, 4, 2, 16


def _student_tokens(f, ids: torch.Tensor, pos: torch.Tensor, types: torch.Tensor, eps: float) -> torch.Tensor:
    z = f.word[ids] + f.position[pos] + f.token_type[types]
    return F.layer_norm(z, (z.shape[-1],), eps=eps) @ f.project_weight.T + f.project_bias


def _tables(gen: torch.Generator, rank: int | None = None) -> list[torch.Tensor]:
    """Word / position / type tables; with ``rank`` their centred rows span a rank-``rank`` subspace."""
    sizes = (50, 20, 2)
    if rank is None:
        return [torch.randn(n, WIDTH, generator=gen) for n in sizes]
    basis = torch.randn(rank, WIDTH, generator=gen, dtype=torch.float64)
    basis, _ = torch.linalg.qr((basis - basis.mean(dim=1, keepdim=True)).T)  # orthonormal, orthogonal to 1
    out = []
    for n in sizes:
        coords = torch.randn(n, rank, generator=gen, dtype=torch.float64)
        offset = torch.randn(n, 1, generator=gen, dtype=torch.float64)  # LayerNorm drops the mean
        out.append((coords @ basis.T + offset).float())
    return out


def test_factorisation_is_exact_at_full_rank_and_improves_with_rank() -> None:
    gen = torch.Generator().manual_seed(0)
    word, pos, types = _tables(gen)
    gain, bias = torch.rand(WIDTH, generator=gen) + 0.5, torch.randn(WIDTH, generator=gen)
    ids, positions, tt = torch.randint(0, 50, (40,)), torch.randint(0, 20, (40,)), torch.randint(0, 2, (40,))
    teacher = F.layer_norm(word[ids] + pos[positions] + types[tt], (WIDTH,), gain, bias, eps=1e-12)
    errors = []
    for k in (WIDTH, 24, 16, 8):
        f = factorise_embeddings(word, pos, types, gain, bias, token_dim=k)
        assert f.word.shape == (50, k) and f.project_weight.shape == (WIDTH, k)
        errors.append((_student_tokens(f, ids, positions, tt, 1e-12) - teacher).pow(2).mean().item())
    assert errors[0] < 1e-10  # k = D: exact
    assert errors == sorted(errors)  # lower rank, larger error


def test_weighted_factorisation_favours_frequent_rows() -> None:
    gen = torch.Generator().manual_seed(1)
    word, pos, types = _tables(gen)
    gain, bias = torch.ones(WIDTH), torch.zeros(WIDTH)
    frequent = torch.tensor([3, 7, 11])
    weights = torch.ones(50)
    weights[frequent] = 1000.0
    ids = frequent.repeat(5)
    positions, tt = torch.zeros_like(ids), torch.zeros_like(ids)
    teacher = F.layer_norm(word[ids] + pos[positions] + types[tt], (WIDTH,), eps=1e-12)

    def error(w: tuple | None) -> float:
        f = factorise_embeddings(word, pos, types, gain, bias, token_dim=8, weights=w)
        return (_student_tokens(f, ids, positions, tt, 1e-12) - teacher).pow(2).mean().item()

    # the rows actually used (3 words, position 0, type 0) span 5 <= k - 1 directions: nearly exact
    seen_positions, seen_types = torch.ones(20), torch.ones(2)
    seen_positions[0] = seen_types[0] = 1000.0
    assert error((weights, seen_positions, seen_types)) < 0.01 * error(None)


@pytest.fixture(scope="module")
def low_rank_teacher():
    """A 4-layer BERT whose embedding tables lie in a rank-(TOKEN_DIM - 1) centred subspace."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=20,
    )
    teacher = BertModel(config).eval()
    word, pos, types = _tables(torch.Generator().manual_seed(2), rank=TOKEN_DIM - 1)
    with torch.no_grad():
        teacher.embeddings.word_embeddings.weight.copy_(word)
        teacher.embeddings.position_embeddings.weight.copy_(pos)
        teacher.embeddings.token_type_embeddings.weight.copy_(types)
        teacher.embeddings.LayerNorm.weight.uniform_(0.5, 1.5)
        teacher.embeddings.LayerNorm.bias.normal_()
    return teacher


def test_layers_are_copies_of_the_teachers_last_k(low_rank_teacher) -> None:
    student = simtde_encoder(low_rank_teacher, layers=KEEP, token_dim=TOKEN_DIM)
    assert type(student).__name__ == "ElectraModel" and student.config.embedding_size == TOKEN_DIM
    assert len(student.encoder.layer) == KEEP
    teacher_state = low_rank_teacher.state_dict()
    copied = 0
    for name, value in student.state_dict().items():
        if name.startswith("encoder.layer."):
            i = int(name.split(".")[2])
            source = name.replace(f"encoder.layer.{i}.", f"encoder.layer.{LAYERS - KEEP + i}.", 1)
            assert torch.equal(value, teacher_state[source]), name
            copied += 1
    assert copied == 16 * KEEP  # every parameter of a BERT layer


def test_student_reproduces_the_teachers_last_k_layers_exactly(low_rank_teacher) -> None:
    student = simtde_encoder(low_rank_teacher, layers=KEEP, token_dim=TOKEN_DIM).eval()
    ids = torch.randint(5, 50, (3, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    types = torch.zeros_like(ids)
    types[2, 4:] = 1
    with torch.no_grad():
        out = student(input_ids=ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        hidden = low_rank_teacher.embeddings(input_ids=ids, token_type_ids=types)
        assert torch.allclose(out.hidden_states[0], hidden, atol=1e-5)  # projected token embeddings
        extended = low_rank_teacher.get_extended_attention_mask(mask, ids.shape)
        for layer in low_rank_teacher.encoder.layer[LAYERS - KEEP :]:
            hidden = layer(hidden, attention_mask=extended)[0]
    real = mask.bool()
    assert torch.allclose(out.last_hidden_state[real], hidden[real], atol=1e-4)


def test_student_is_a_plain_sentence_transformer_that_exports(tiny_bert, tmp_path) -> None:
    import onnxruntime as ort
    from sentence_transformers import SentenceTransformer

    from export.onnx_graph import export_onnx
    from tests.tiny_models import tiny_sentences

    texts = tiny_sentences(5, seed=4)
    student = build_simtde_student(
        str(tiny_bert), layers=1, token_dim=8, dim=6, max_seq_len=32, sample_texts=tiny_sentences(50)
    ).eval()
    assert [type(m).__name__ for m in student] == ["Transformer", "Pooling", "Dense", "Normalize"]
    student.save(str(tmp_path / "st"))
    reloaded = SentenceTransformer(str(tmp_path / "st"))
    expected = student.encode(texts, convert_to_tensor=True)
    assert torch.allclose(reloaded.encode(texts, convert_to_tensor=True), expected, atol=1e-6)

    info = export_onnx(reloaded, tmp_path / "model.onnx")
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    features = reloaded.tokenize(texts)
    (onnx_out,) = session.run(None, {name: features[name].numpy() for name in info.input_names})
    assert info.dim == 6 and torch.allclose(torch.from_numpy(onnx_out), expected, atol=1e-5)

    # what batch_loss sees: student and source token embeddings on one tokenised batch
    features = student.tokenize(texts)
    tokens, sentence = simtde_forward(student, features)
    teacher = teacher_token_embeddings(teacher_token_embedder(str(tiny_bert)), features)
    length = features["input_ids"].shape[1]
    assert tokens.shape == teacher.shape == (5, length, 32) and sentence.shape == (5, 6)
    assert not teacher.requires_grad
    assert torch.allclose(F.normalize(sentence, dim=-1), expected, atol=1e-5)


def test_token_weights_count_occurrences(tiny_bert) -> None:
    from transformers import AutoConfig, AutoTokenizer

    tokenizer, config = AutoTokenizer.from_pretrained(tiny_bert), AutoConfig.from_pretrained(tiny_bert)
    words, positions, types = token_weights(tokenizer, config, ["the dog", "the cat ."], batch=1)
    the = tokenizer.convert_tokens_to_ids("the")
    assert words[the] == 3 and words[tokenizer.cls_token_id] == 3  # counts + 1
    assert positions[:6].tolist() == [3, 3, 3, 3, 2, 1]  # 4 and 5 tokens
    assert types.tolist()[:1] == [10]  # 4 + 5 tokens of type 0, + 1


def test_refuses_bad_sources_and_sizes(low_rank_teacher) -> None:
    with pytest.raises(UserError, match="below the hidden size"):
        simtde_encoder(low_rank_teacher, layers=1, token_dim=WIDTH)
    with pytest.raises(UserError, match="out of range"):
        simtde_encoder(low_rank_teacher, layers=LAYERS + 1, token_dim=8)
    low_rank_teacher.config.model_type = "mpnet"
    try:
        with pytest.raises(UserError, match="BERT-family"):
            simtde_encoder(low_rank_teacher, layers=1, token_dim=8)
    finally:
        low_rank_teacher.config.model_type = "bert"
