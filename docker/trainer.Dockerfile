# dttrainer (CPU: Debian's LibTorch with Gloo) and dtctl, built exactly as CI builds them.
#   docker build -f docker/trainer.Dockerfile -t dt-trainer .
FROM debian:12
COPY . /src
WORKDIR /src
RUN scripts/build.sh --install /opt/dt --target dttrainer --target dtctl
ENV PATH=/opt/dt/bin:$PATH
ENTRYPOINT ["/opt/dt/bin/dttrainer"]
