"""The attention FLOP floor the server benchmark compares feather's attention time with."""

from feather_bench.attention_e2e import attention_flops


def test_counts_each_shared_prefix_once_and_every_decode_step():
    # prompt 1 computes positions 1-3 (1+2+3 keys), prompt 2 only position 3 (its first two
    # tokens are prompt 1's); each then decodes 2 tokens, the first of which comes from the
    # prefill: one decode step each, at position 4.
    prompts = [[1, 2, 3], [1, 2, 4]]
    keys = (1 + 2 + 3) + 4 + 3 + 4
    assert attention_flops(prompts, max_new_tokens=2, layers=1, heads=1, head_dim=1) == 4 * keys
    assert attention_flops(prompts, 2, layers=30, heads=9, head_dim=64) == 4 * 30 * 9 * 64 * keys


def test_does_not_depend_on_the_order_prompts_arrive_in():
    system, doc_a, doc_b = list(range(100, 140)), [7] * 20, [8] * 30
    prompts = [
        system + doc_a + [1],
        system + doc_b + [2],
        system + doc_a + [3],
        [5, 6],
        system + [9],
    ]
    flops = attention_flops(prompts, 8, 2, 3, 4)
    assert attention_flops(prompts[::-1], 8, 2, 3, 4) == flops
    assert attention_flops(prompts[2:] + prompts[:2], 8, 2, 3, 4) == flops


def test_a_repeated_prompt_still_computes_its_last_token():
    # a radix-cache hit on the whole prompt still runs its last token to get the logits
    assert attention_flops([[1, 2], [1, 2]], 1, 1, 1, 1) == 4 * ((1 + 2) + 2)
