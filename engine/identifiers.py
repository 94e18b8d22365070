"""What can go on an identifier: one rule for the decoding constraints and for the language
server (an alternative that would run a completed name on into another)."""


def goes_on_name(char: str) -> bool:
    """`char` can go on an identifier (a letter, digit, `_` or `$`); "" (an empty token's text)
    counts as going on too, so that such a token never ends a name."""
    return char.isalnum() or char in "_$"
