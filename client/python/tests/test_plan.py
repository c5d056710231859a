"""The client's decisions as plain state, without a server: what a broken generation asks next
(ResumePlan), what the caller sees of each attempt, and when an idempotent call is repeated."""
import grpc
import pytest

from krause_serve import GeneratedImage, KrauseError, Rows, Start
from krause_serve._calls import retry_delay
from krause_serve._gen.krause.v1 import krause_pb2 as pb
from krause_serve._generate import ResumePlan, generate_request

W = 4  # a 3x4x1 image: 4 bytes per row


def start_message(seed=5):
    m = pb.GenerateResponse()
    m.start.CopyFrom(pb.GenerateStart(model="karm", model_version="2", seed=seed, height=3,
                                      width=W, channels=1))
    return m


def rows_message(image, first_row, rows):
    m = pb.GenerateResponse()
    m.rows.append(pb.ImageRows(image=image, first_row=first_row, num_rows=rows,
                               pixels=bytes([image * 16 + first_row + r for r in range(rows)
                                             for _ in range(W)])))
    return m


def unavailable(delay=None):
    return KrauseError(grpc.StatusCode.UNAVAILABLE, "replica gone", retry_delay=delay)


def test_a_break_asks_completions_of_the_rows_received_and_runs_of_untouched_images():
    request = generate_request(model="karm", n=5, seed=5, label="Bag", guidance=2.0)
    plan = ResumePlan(request)
    events = list(plan.on_message(start_message(), [0, 1, 2, 3, 4]))
    assert events == [Start("karm", "2", 5, 0, (3, W, 1))]
    done = pb.GenerateResponse()
    done.images.append(pb.GeneratedImage(image=0, seed=5, png=b"png0"))
    seen = [list(plan.on_message(rows_message(0, 0, 3), range(5))),
            list(plan.on_message(done, range(5))),
            list(plan.on_message(rows_message(1, 0, 2), range(5))),
            list(plan.on_message(rows_message(4, 0, 3), range(5)))]
    assert isinstance(seen[1][0], GeneratedImage) and seen[1][0].image == 0
    assert plan.on_break(unavailable(0.25)) == 0.25  # the server's RetryInfo delay
    asked = [(r.first_image, r.num_images, r.prompt_rows, r.prompt.raw.height, r.version,
              r.seed, r.label, r.guidance, list(images)) for r, images in plan.attempts()]
    assert asked == [
        (1, 1, 2, 2, "2", 5, "Bag", 2.0, [1]),   # image 1: a completion of its 2 rows
        (2, 2, 0, 0, "2", 5, "Bag", 2.0, [2, 3]),  # images 2 and 3: untouched, together
        (4, 1, 2, 2, "2", 5, "Bag", 2.0, [4]),   # image 4: every row came, not its PNG
    ]
    r, images = plan.attempts()[0]
    assert r.prompt.raw.pixels == bytes([16] * W + [17] * W)
    # The completion's stream repeats the prompt rows: the caller gets only the new row.
    got = list(plan.on_message(rows_message(0, 0, 3), images))
    assert len(got) == 1 and isinstance(got[0], Rows)
    assert (got[0].image, got[0].first_row, got[0].pixels.shape) == (1, 2, (1, W, 1))


def test_a_replica_with_other_numerics_is_not_spliced_in():
    plan = ResumePlan(generate_request(model="karm", n=1, seed=5))
    first = start_message()
    first.start.numerics = "fp32 fused_cpu on cpu, avx2 kernel family"
    assert list(plan.on_message(first, [0]))[0].numerics == first.start.numerics
    list(plan.on_message(rows_message(0, 0, 2), [0]))
    plan.on_break(unavailable(0))
    other = start_message()
    other.start.numerics = "fp32 fused_cpu on cpu, base kernel family"
    with pytest.raises(KrauseError) as e:
        list(plan.on_message(other, [0]))
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert '"fp32 fused_cpu on cpu, base kernel family", the stream began with ' \
           '"fp32 fused_cpu on cpu, avx2 kernel family"' in e.value.message
    same = start_message()
    same.start.numerics = first.start.numerics  # the same numerics resume as usual
    assert list(plan.on_message(same, [0])) == []


def test_breaks_back_off_and_give_up():
    plan = ResumePlan(generate_request(n=1, seed=1), max_resumes=2)
    with pytest.raises(KrauseError):  # no start yet: nothing to resume from
        plan.on_break(unavailable())
    list(plan.on_message(start_message(1), [0]))
    assert plan.on_break(unavailable()) == 0.05
    assert plan.on_break(unavailable()) == 0.1  # doubling for breaks in a row
    with pytest.raises(KrauseError):  # max_resumes reached
        plan.on_break(unavailable())
    plan = ResumePlan(generate_request(n=1, seed=1))
    list(plan.on_message(start_message(1), [0]))
    with pytest.raises(KrauseError):  # the request's own error is not resumed
        plan.on_break(KrauseError(grpc.StatusCode.INVALID_ARGUMENT, "label"))


def test_a_seed_is_drawn_on_the_client_and_settings_are_checked():
    assert generate_request().HasField("seed")
    assert generate_request(seed=9).seed == 9
    with pytest.raises(ValueError):
        generate_request(label="Bag", class_index=3)
    with pytest.raises(ValueError):
        generate_request(prompt=b"\x89PNG\r\n\x1a\n")  # a prompt needs prompt_rows


def test_idempotent_calls_repeat_refusals_as_the_server_says():
    refused = KrauseError(grpc.StatusCode.UNAVAILABLE, "queue full", retry_delay=0.25)
    assert retry_delay(refused, 0, 3) == 0.25
    assert retry_delay(KrauseError(grpc.StatusCode.UNAVAILABLE, "down"), 2, 3) == 0.2
    assert retry_delay(refused, 3, 3) is None  # retries spent
    assert retry_delay(KrauseError(grpc.StatusCode.INVALID_ARGUMENT, "images[0]"), 0, 3) is None
