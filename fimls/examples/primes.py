"""A tiny module used by `fimls complete` when no FILE:LINE is given."""


def is_prime(n: int) -> bool:
    """Return True if n is a prime number."""
    if n < 2:
        return False
    for d in range(2, int(n ** 0.5) + 1):
        if n % d == 0:
            return False
    return True


def primes_below(limit: int) -> list[int]:
    """All primes smaller than limit, in increasing order."""
    result = []
    for n in range(2, limit):


if __name__ == "__main__":
    print(primes_below(30))
