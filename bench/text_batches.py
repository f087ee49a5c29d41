"""weft::TextCorpus's batches in Python's standard library: the PyTorch
peer of weft-train-gpt (torch_train_peer.py --model gpt) trains on the same
windows of the same bytes as Weft.

The file's bytes split as nanoGPT splits them (the first 90% training, the
rest validation); training batch `step` of a run with the value `run` (the
trainers' --seed) is B window offsets drawn by std::mt19937_64, initialized
by the standard's sequence mixer over {run low, run high, step low, step
high} (32-bit words), through the unbiased bounded draw
(weft::detail::bounded_draw); validation batch i of n is B windows at evenly
spaced offsets of the validation split. Both generators are written out as
the C++ standard defines them ([rand.util], [rand.eng.mers]);
tests/scripts/check_torch_peer_batches.py compares them with weft::TextCorpus.
"""


class MixedMt64:
    """std::mt19937_64 initialized from the standard's sequence mixer over
    `words`, as the C++ standard defines both ([rand.util], [rand.eng.mers]): weft::TextCorpus's
    generator, so this peer draws the same training windows."""

    N, M, R = 312, 156, 31
    A = 0xB5026F5AA96619E9
    MASK = (1 << 64) - 1

    def __init__(self, words):
        n, s, m32 = 2 * self.N, len(words), 0xFFFFFFFF
        a = [0x8B8B8B8B] * n
        t = 11 if n >= 623 else 7 if n >= 68 else 5 if n >= 39 else 3 if n >= 7 else (n - 1) // 2
        p = (n - t) // 2
        q = p + t
        m = max(s + 1, n)

        def mix(x):
            return x ^ (x >> 27)
        for k in range(m):
            r1 = (1664525 * mix(a[k % n] ^ a[(k + p) % n] ^ a[(k - 1) % n])) & m32
            if k == 0:
                r2 = (r1 + s) & m32
            elif k <= s:
                r2 = (r1 + k % n + words[k - 1]) & m32
            else:
                r2 = (r1 + k % n) & m32
            a[(k + p) % n] = (a[(k + p) % n] + r1) & m32
            a[(k + q) % n] = (a[(k + q) % n] + r2) & m32
            a[k % n] = r2
        for k in range(m, m + n):
            r3 = (1566083941 * mix((a[k % n] + a[(k + p) % n] + a[(k - 1) % n]) & m32)) & m32
            r4 = (r3 - k % n) & m32
            a[(k + p) % n] ^= r3
            a[(k + q) % n] ^= r4
            a[k % n] = r4
        self.x = [a[2 * i] | (a[2 * i + 1] << 32) for i in range(self.N)]
        if self.x[0] >> self.R == 0 and not any(self.x[1:]):
            self.x[0] = 1 << 63
        self.i = self.N

    def _twist(self):
        x, n, upper, lower = self.x, self.N, (self.MASK << self.R) & self.MASK, (1 << self.R) - 1
        for i in range(n):
            y = (x[i] & upper) | (x[(i + 1) % n] & lower)
            x[i] = x[(i + self.M) % n] ^ (y >> 1) ^ (self.A if y & 1 else 0)
        self.i = 0

    def __call__(self):
        if self.i >= self.N:
            self._twist()
        y = self.x[self.i]
        self.i += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & self.MASK

    def bounded(self, n):
        """Uniform in [0, n): weft::detail::bounded_draw (rejection of the low 2^64 mod n values)."""
        threshold = (1 << 64) % n
        while True:
            r = self()
            if r >= threshold:
                return r % n


class CorpusError(Exception):
    pass


class TextCorpus:
    """weft::TextCorpus: the file's bytes, the first 90% training, the rest validation."""

    def __init__(self, path, context):
        try:
            with open(path, "rb") as f:
                self.data = f.read()
        except OSError as e:
            raise CorpusError(f"text corpus {path}: {e.strerror}")
        if context <= 0:
            raise CorpusError(f"text corpus {path}: context {context} must be positive")
        if not self.data:
            raise CorpusError(f"text corpus {path}: the file is empty (a corpus needs text)")
        self.path, self.context = path, context
        self.train_size = len(self.data) * 9 // 10
        need = context + 1
        if self.train_size < need or len(self.data) - self.train_size < need:
            raise CorpusError(f"text corpus {path}: {len(self.data)} bytes split into {self.train_size} training and "
                              f"{len(self.data) - self.train_size} validation bytes; each split needs at least one "
                              f"sequence of context + 1 = {need} bytes")

    def train_offsets(self, run, step, batch):
        """The B window starts of training batch `step` (TextCorpus::train_batch)."""
        words = [run & 0xFFFFFFFF, (run >> 32) & 0xFFFFFFFF, step & 0xFFFFFFFF, (step >> 32) & 0xFFFFFFFF]
        gen = MixedMt64(words)
        starts = self.train_size - self.context
        return [gen.bounded(starts) for _ in range(batch)]

    def validation_offsets(self, index, count, batch):
        """The B window starts of validation batch `index` of `count` (TextCorpus::validation_batch)."""
        sequences = count * batch
        span = len(self.data) - self.train_size - self.context - 1
        return [self.train_size + (0 if sequences == 1 else (index * batch + b) * span // (sequences - 1))
                for b in range(batch)]

    def window_ids(self, offset):
        """One window's input ids and target ids (the next bytes) as lists."""
        w = self.data[offset:offset + self.context + 1]
        return list(w[:-1]), list(w[1:])
