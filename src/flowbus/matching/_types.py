"""Array dtypes shared by the matcher's modules."""

import numpy as np

I8 = np.int8
I16 = np.int16
I32 = np.int32
I64 = np.int64
U64 = np.uint64
F64 = np.float64
