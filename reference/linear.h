// The model's linear layers, y = x · Wᵀ (+ b), with the float32 CPU product on oneDNN's inner
// product where LibTorch has it (its mkldnn::_linear_pointwise), else ATen's.
//
// Why: ATen's float32 CPU matmul is MKL's sgemm, which on an AMD CPU with AVX-512 runs its AVX2
// kernels: 108 GFLOP/s on one thread against oneDNN's 224 on the model's shapes on a Zen 5 EPYC,
// and these products are three quarters of a step (on a Zen 4 EPYC, whose AVX-512 runs on 256-bit
// halves, both reach the core's peak, 87-104 against 113: docs/measurements.md). oneDNN's
// product is plain float32 (no reduced-precision math mode is set), deterministic, and a row of
// its result does not depend on the other rows of the batch, so a microbatch's rows come out as
// the whole batch's do, as with MKL.
//
// Layers with fewer than 128 × 128 weights stay on ATen: below about 2^20 multiply-adds oneDNN's
// call costs more than its kernel saves (measured in linear.cc), and the choice is the layer's,
// never the batch's, so a microbatch and the whole batch run the same kernel.
//
// Which kernel runs is one process-wide choice, PIPECHECK_CPU_GEMM=onednn (the default where
// available) or aten, read once and inherited by every rank a run starts (the layers' RMSNorm
// follows it: reference/rms_norm.h); `CpuGemmName` says
// which is in effect (`pipecheck --version` prints it). Float64 and reduced-precision dtypes, and every
// non-CPU device, always take ATen's path (oneDNN has no float64 product; bfloat16 already goes
// to oneDNN through ATen where the CPU supports it).
#pragma once

#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include <string>

namespace pipecheck::reference {

// x · weightᵀ + bias (bias may be undefined), x of shape (..., in), weight (out, in): the forward
// and its x gradient on oneDNN for float32 CPU tensors when enabled, the weight gradient on ATen.
torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias = {});

// Whether Linear runs a layer of `in` × `out` weights on oneDNN for activations of this dtype and
// device (the memory model follows the kernel: their saved tensors differ).
bool LinearOnOneDnn(torch::Dtype dtype, torch::Device device, int64_t in, int64_t out);

// A torch::nn::Linear's parameters through Linear.
torch::Tensor Linear(const torch::nn::Linear& layer, const torch::Tensor& x);

// Gradient-accumulation fusion (Megatron's gradient_accumulation_fusion, here on the CPU): while
// one is alive on a thread, a backward that thread runs through Linear's oneDNN layers adds each
// weight's gradient straight into the weight's existing .grad (dW += dyᵀ · x, one product with
// beta = 1) and hands autograd none for it, where the unfused layer makes dyᵀ · x and AccumulateGrad
// then adds it: one pass over each weight's gradient fewer and no temporary, for each backward of
// a step after its first (the first makes .grad as before). Only where that backward accumulates
// into .grad anyway: a backward that captures gradients (accumulate_grad false, autograd::grad)
// must not run under one. As with AccumulateGrad, whoever else holds the .grad sees the sum (it
// adds in place too, outside create_graph); weights with a tensor hook fall back to it. The product
// adds into .grad inside its kernel, so the sum may differ from the unfused one by rounding where
// the kernel splits the token dimension (at 256 tokens a microbatch it was the same bit for bit).
class FusedWeightGradients {
 public:
  FusedWeightGradients();
  ~FusedWeightGradients();
  FusedWeightGradients(const FusedWeightGradients&) = delete;
  FusedWeightGradients& operator=(const FusedWeightGradients&) = delete;
};

// "onednn" or "aten": the float32 CPU product in effect. Throws (naming the variable and its value)
// when PIPECHECK_CPU_GEMM is set to anything else, or to onednn where this LibTorch lacks it.
std::string CpuGemmName();

}  // namespace pipecheck::reference
