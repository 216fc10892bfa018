"""Experience memory (LightSearcher, HiExp): see the memory issue."""

__all__: list[str] = []
