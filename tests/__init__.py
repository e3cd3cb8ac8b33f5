# Before any test module or nightcrew is imported, and before xdist starts its workers (they
# inherit the environment): bytecode is compiled once, into the user's cache, not the checkout.
from tests.support.bytecode import cache_bytecode_outside_the_checkout

cache_bytecode_outside_the_checkout()
