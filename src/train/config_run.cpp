// The run, data and model sections of the training configuration (config_sections.h).
#include "shardgan/device/device.h"
#include "shardgan/models/family.h"
#include "shardgan/train/config_sections.h"

namespace shardgan::config_sections {

void read_run(Reader& r, TrainConfig& c) {
  c.run_dir = r.get<std::string>("run.dir", c.run_dir, "run folder: samples, metrics.jsonl, plots, checkpoints, log");
  c.seed = r.get<uint64_t>("run.seed", c.seed, "seed of parameters, latents and data order");
  c.device = r.get<std::string>("run.device", c.device, "cpu or cuda (each rank computes on cuda:<local rank>)");
  require(c.device == "cpu" || c.device == "cuda", r, "run.device", "must be cpu or cuda");
  require(c.device != "cuda" || cuda_compiled_in(), r, "run.device",
          "cuda needs a build with the CUDA runtime compiled in (CMake compiles it in where it finds libcudart; "
          "`shardgan-train --version` says whether a binary has it); otherwise use run.device=cpu");
  c.tf32 = r.get<bool>("run.tf32", c.tf32,
      "cuda only: cuDNN convolutions may compute float32 in TF32 (PyTorch's default)");
  c.deterministic = r.get<bool>("run.deterministic", c.deterministic,
      "torch's deterministic algorithms (for bit-for-bit comparisons on a GPU; slower)");
}

void read_data(Reader& r, TrainConfig& c) {
  c.data_source = r.get<std::string>("data.source", c.data_source,
      "fashion-mnist (idx files, in RAM), synthetic, hdf5 (read per rank in chunks), or paired (a folder of "
      "pix2pix A|B images, in RAM)");
  require(c.data_source == "fashion-mnist" || c.data_source == "synthetic" || c.data_source == "hdf5" ||
              c.data_source == "paired",
          r, "data.source", "must be 'fashion-mnist', 'synthetic', 'hdf5' or 'paired'");
  c.data_path = r.get<std::string>("data.path", c.data_path,
      "the Fashion-MNIST folder, the .h5 file for data.source hdf5, or the folder of A|B images for paired");
  c.synthetic_size = r.get<int64_t>("data.synthetic_size", c.synthetic_size, "images in the synthetic dataset");
  require(c.synthetic_size > 0, r, "data.synthetic_size", "must be > 0");
  c.prefetch_batches = r.get<int64_t>("data.prefetch_batches", c.prefetch_batches,
      "hdf5 read-ahead queue, in micro-batches");
  require(c.prefetch_batches >= 1 && c.prefetch_batches <= 1024, r, "data.prefetch_batches", "must be 1 to 1024");
}

void read_model(Reader& r, TrainConfig& c) {
  std::string dtype = r.get<std::string>(
      "model.dtype", "float32", "dtype of the master parameters and optimizer state: float32 or float64");
  require(dtype == "float32" || dtype == "float64", r, "model.dtype", "must be float32 or float64");
  c.model_dtype = dtype == "float64" ? at::kDouble : at::kFloat;
  c.family = make_family(r);
}

}  // namespace shardgan::config_sections
