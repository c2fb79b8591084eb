# Writes the .npy fixtures read by tests/harness/numerics.rs (run once with
# numpy; the outputs are committed): `python3 make.py` in this directory.
import numpy as np

np.save("f32_2x3.npy", np.array([[0.0, 1.5, -2.0], [3.25, 4.0, -5.5]], dtype=np.float32))
np.save("f16_4.npy", np.array([0.5, -1.0, 2.0, 65504.0], dtype=np.float16))
np.save("i64_2x2.npy", np.array([[1, -2], [3, 10**12]], dtype=np.int64))
np.save("bool_3.npy", np.array([True, False, True]))
np.save("u8_scalar.npy", np.array(200, dtype=np.uint8))
np.save("f64_fortran.npy", np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)))
