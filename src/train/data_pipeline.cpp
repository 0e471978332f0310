#include "shardgan/train/data_pipeline.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "shardgan/checkpoint/checkpoint.h"
#include "shardgan/data/edges.h"
#include "shardgan/data/hdf5_dataset.h"
#include "shardgan/data/hdf5_loader.h"
#include "shardgan/data/images.h"
#include "shardgan/data/paired_folder.h"
#include "shardgan/models/family.h"
#include "shardgan/train/config.h"
#include "shardgan/train/inference.h"

namespace shardgan {
namespace {

// data.source hdf5: opens data.path and checks that its images and labels fit the model.
std::unique_ptr<data::Hdf5Dataset> open_hdf5(const TrainConfig& cfg, const ImageShape& shape, int64_t classes) {
  auto ds = std::make_unique<data::Hdf5Dataset>(cfg.data_path);
  if (ds->channels() != shape.channels || ds->height() != shape.height || ds->width() != shape.width) {
    throw ConfigError(cfg.source + ": data.path " + cfg.data_path + " holds " + std::to_string(ds->channels()) + "x" +
                      std::to_string(ds->height()) + "x" + std::to_string(ds->width()) +
                      " images but model.channels and the model's resolution give " + std::to_string(shape.channels) +
                      "x" + std::to_string(shape.height) + "x" + std::to_string(shape.width) +
                      "; convert the images to that size (shardgan-data convert --size --channels)");
  }
  if (classes > 0) ds->check_labels(classes);
  const int64_t ca = cfg.family->condition_channels();
  if (ca > 0 && ds->condition_channels() != ca) {
    throw ConfigError(cfg.source + ": data.path " + cfg.data_path +
                      (ds->condition_channels() == 0 ? std::string(" holds no dataset 'A' of input images")
                                                     : " holds " + std::to_string(ds->condition_channels()) +
                                                           "-channel input images A") +
                      " but the model translates " + std::to_string(ca) + "-channel ones (model.in_channels); write "
                      "a file of pairs with shardgan-data convert --paired");
  }
  return ds;
}

}  // namespace

DataPipeline::DataPipeline(const TrainConfig& cfg, const ModelFamily& family, int data_rank, int data_size,
                           bool reads_data, bool log, at::Tensor images, at::Tensor labels)
    : cfg_(cfg), family_(family), data_rank_(data_rank), data_size_(data_size), log_(log),
      noise_gen_(at::detail::createCPUGenerator(cfg.seed + 3)) {
  if (!reads_data) return;  // split placement, G's ranks: the counters come from D's ranks
  if (!images.defined() && cfg_.data_source == "hdf5") {
    const int64_t classes = family_.num_classes();
    dataset_ = open_hdf5(cfg_, family_.image_shape(), classes);
    sampler_ = std::make_unique<DistributedSampler>(dataset_->size(), cfg_.global_batch, data_rank_, data_size_,
                                                    cfg_.seed, cfg_.micro_batches);
    loader_ = std::make_unique<data::Hdf5Loader>(*dataset_, *sampler_, cfg_.micro_batches, cfg_.model_dtype,
                                                 cfg_.prefetch_batches, classes > 0, family_.condition_channels() > 0);
  } else {
    load_images(std::move(images), std::move(labels));
  }
}

DataPipeline::~DataPipeline() {
  loader_.reset();
  dataset_.reset();
}

void DataPipeline::load_images(at::Tensor images, at::Tensor labels) {
  const ImageShape shape = family_.image_shape();
  const int64_t classes = family_.num_classes();
  images_ = std::move(images);
  labels_ = std::move(labels);
  if (!images_.defined()) {
    if (cfg_.data_source == "synthetic") {
      images_ = synthetic_images(cfg_, cfg_.synthetic_size, cfg_.seed + 17);
    } else if (cfg_.data_source == "paired") {  // pix2pix's A|B folder, decoded into RAM
      const data::PairedImages p = data::read_paired_folder(cfg_.data_path, shape.height, shape.channels);
      images_ = data::scale_pixels(p.b, cfg_.model_dtype);
      labels_ = data::scale_pixels(p.a, cfg_.model_dtype);
      if (log_) {
        spdlog::info("data.source paired: {} pairs from {} ({}x{}x{})", images_.size(0), cfg_.data_path,
                     shape.channels, shape.height, shape.width);
      }
    } else {
      if (shape.channels != 1 || shape.height != 32 || shape.width != 32) {
        throw ConfigError(cfg_.source + ": data.source fashion-mnist gives 1x32x32 images but model." +
                          "channels and the model's resolution give " + std::to_string(shape.channels) + "x" +
                          std::to_string(shape.height) + "x" + std::to_string(shape.width) +
                          "; use model.channels: 1 and a 32x32 architecture, or data.source: synthetic");
      }
      images_ = load_fashion_mnist(cfg_.data_path, cfg_.model_dtype);
      if (classes > 0) labels_ = load_fashion_mnist_labels(cfg_.data_path);
    }
  }
  if (family_.condition_channels() > 0) {
    // Image-to-image: each image B is paired with its edge map A, which takes the labels'
    // place in the real batch ({B, A}) unless the caller gave the A images itself.
    if (!labels_.defined()) labels_ = data::sobel_edges(images_, family_.condition_channels());
  } else if (classes > 0 && !labels_.defined()) {
    labels_ = make_synthetic_labels(images_.size(0), cfg_.seed + 18, classes);
  }
  if (classes > 0 && labels_.max().item<int64_t>() >= classes) {
    throw ConfigError(cfg_.source + ": the data has labels up to " + std::to_string(labels_.max().item<int64_t>()) +
                      " but model.n_classes is " + std::to_string(classes));
  }
  sampler_ = std::make_unique<DistributedSampler>(images_.size(0), cfg_.global_batch, data_rank_, data_size_,
                                                  cfg_.seed, cfg_.micro_batches);
}

TensorList DataPipeline::draw_latents() {
  // Every rank draws the whole global batch and keeps its slices, so the latents do not
  // depend on the world size (required for parity with the one-rank reference).
  at::Tensor z = family_.sample_latents(cfg_.global_batch, noise_gen_, cfg_.model_dtype);
  at::Tensor y = family_.sample_labels(cfg_.global_batch, noise_gen_);
  return {z, y};
}

at::Tensor DataPipeline::draw_normal(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::randn(sizes, noise_gen_, torch::TensorOptions().dtype(dtype));
}

at::Tensor DataPipeline::local_micro(const at::Tensor& global, int64_t micro) const {
  const int64_t per_micro = global.size(0) / cfg_.micro_batches;
  const int64_t local = per_micro / data_size_;
  return global.narrow(0, micro * per_micro + data_rank_ * local, local).contiguous();
}

TensorList DataPipeline::real_micro(int64_t micro, TrainCounters& counters) {
  if (micro == 0) {  // the next global batch of the sampler
    batch_epoch_ = counters.epoch;
    batch_index_ = counters.batch_in_epoch;
    if (++counters.batch_in_epoch == sampler_->batches_per_epoch()) {
      counters.batch_in_epoch = 0;
      ++counters.epoch;
    }
  }
  if (loader_) return loader_->get(batch_epoch_, batch_index_, micro);
  at::Tensor idx = sampler_->indices(batch_epoch_, batch_index_, micro);
  return {images_.index_select(0, idx), labels_.defined() ? labels_.index_select(0, idx) : at::Tensor()};
}

DataPipeline::Position DataPipeline::position() const { return {batch_epoch_, batch_index_, noise_state()}; }

void DataPipeline::restore(const Position& p) {
  batch_epoch_ = p.batch_epoch;
  batch_index_ = p.batch_index;
  set_noise_state(p.noise_state);
}

at::Tensor DataPipeline::noise_state() const { return noise_gen_.get_state(); }

void DataPipeline::set_noise_state(const at::Tensor& s) { noise_gen_.set_state(s); }

void DataPipeline::restart(int64_t epoch, int64_t batch_in_epoch) {
  if (loader_) loader_->restart(epoch, batch_in_epoch);
}

std::unique_lock<std::mutex> DataPipeline::pause_reads() {
  return loader_ ? loader_->pause_reads() : std::unique_lock<std::mutex>();
}

int64_t DataPipeline::batches_per_epoch() const { return sampler_ ? sampler_->batches_per_epoch() : 0; }

}  // namespace shardgan
