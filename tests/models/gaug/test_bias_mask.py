import torch

from locatdino.models.gaug.bias_mask import outer_product_mask, write_bias_rows


def test_mask_layout_and_gradients():
    torch.manual_seed(0)
    rows = torch.rand(2, 1, 6, 2, dtype=torch.float64, requires_grad=True)
    cols = torch.rand(2, 1, 6, 3, dtype=torch.float64, requires_grad=True)
    mask = outer_product_mask(rows, cols, 2, torch.float64)
    assert mask.shape == (2, 1, 8, 8)
    assert mask[..., :2, :].abs().sum() == 0 and mask[..., :, :2].abs().sum() == 0
    p, i, j = 4, 1, 2  # query patch 4, key patch at row 1, column 2 (index 1·3 + 2)
    assert mask[0, 0, 2 + p, 2 + i * 3 + j] == rows[0, 0, p, i] * cols[0, 0, p, j]
    assert torch.autograd.gradcheck(lambda r, c: outer_product_mask(r, c, 2, torch.float64), (rows, cols))


def test_row_chunks_compose_the_full_mask():
    torch.manual_seed(0)
    rows, cols = torch.rand(3, 12, 3), torch.rand(3, 12, 4)
    full = outer_product_mask(rows, cols, 5, torch.float32)
    for start, stop in [(0, 3), (3, 9), (9, 17), (0, 17)]:
        chunk = torch.full((3, stop - start, 17), float("nan"))
        write_bias_rows(chunk, rows, cols, 5, start)
        torch.testing.assert_close(chunk, full[:, start:stop], rtol=0, atol=0)
