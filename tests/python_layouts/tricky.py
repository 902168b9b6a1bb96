"""Source for the line table tests (compiled, never run): constructs whose instructions
spread over several lines or share lines in unusual ways."""
import functools


def decorator(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)
    return wrapper


@decorator
@functools.lru_cache(
    maxsize=None,
)
def decorated(a,
              b=(1 +
                 2),
              *rest, key=lambda x: (x,
                                    x)):
    total = (a
             + b
             - len(rest))
    values = [x * y
              for x in range(a)
              if x % 2
              for y in range(b)]
    mapping = {k:
               v for k, v in zip(values,
                                 values)}
    generator = (
        x
        for x in values
    )
    try:
        result = sum(generator) / (
            total
        )
    except ZeroDivisionError:
        result = None
    finally:
        pass
    while total > 0:
        total -= 1
        if total == 3:
            continue
        elif total == 5:
            break
    else:
        total = -1
    with open(__file__) as a, \
            open(__file__) as b:
        text = a.read() + b.read()
    fn = lambda q: (q if q
                    else -q)
    return (result, mapping, text, fn,
            [lambda: i for i in range(3)])


class Outer:
    class Inner:
        def method(self):
            def nested():
                return [
                    self,
                ]
            return nested


async def coroutine(session):
    async with session as s:
        async for item in s:
            await item
    return [x async for x in session]


def gen():
    x = yield 1
    yield from range(x)
    assert x, (
        "message"
    )
    del x
    global G
    G = 1


very_long = [
    i for i in range(300)
] + [0] * 300
if very_long:
    pass
