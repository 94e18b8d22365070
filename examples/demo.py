import math


def is_prime(n: int) -> bool:
    """Return True when n is a prime number."""
    if n < 2:
        return False
    for divisor in range(2, int(math.sqrt(n)) + 1):
        if n % divisor == 0:
            return False
    return True


def primes_below(limit: int) -> list[int]:
    """All prime numbers smaller than limit."""
    
