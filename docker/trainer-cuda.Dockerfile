# dttrainer with NCCL: an NVIDIA CUDA toolkit and an upstream CUDA LibTorch (Torch_DIR), so
# USE_C10D_NCCL is defined and --backend nccl works. Run with --gpus all.
#   docker build -f docker/trainer-cuda.Dockerfile -t dt-trainer-cuda .
FROM debian:12
COPY . /src
WORKDIR /src
RUN scripts/setup-cuda.sh /opt/libtorch
RUN scripts/build.sh --torch-dir /opt/libtorch/share/cmake/Torch --install /opt/dt --target dttrainer --target dtctl
ENV PATH=/opt/dt/bin:$PATH LD_LIBRARY_PATH=/opt/libtorch/lib
ENTRYPOINT ["/opt/dt/bin/dttrainer"]
