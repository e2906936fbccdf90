//! The CUDA backend, chosen at run time; kernels are compiled with NVRTC on the device.
