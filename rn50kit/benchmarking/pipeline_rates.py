"""What a DALI CPU training pipeline's measured rates mean (tools/bench_io.py): its share of decoding alone and
what it adds per image after the decoder, its scaling over threads against linear, the cores of this kind that
feed a GPU's training, and per-device pipelines against one pipeline."""
import math

# ResNet-50 v1.5 float16 training images/s of one GPU published for the original MXNet example (V100 16 GB in a
# DGX-1, batch 208; A100 80 GB): the rate its input pipeline must keep up with.
GPU_RATES = {"V100": 1442, "A100": 3410}
# What the DALI CPU pipeline should reach (each measured fraction is printed beside these).
SHARE_OF_DECODE_TARGET = 0.85
SCALING_TARGET = 0.9


def pipeline_summary(name, decode_rate, dali_decode_rate, one_thread, all_threads, threads, cores):
    """One DALI CPU training pipeline against decoding alone and against linear scaling: (lines, result)."""
    share = one_thread / decode_rate
    after_decode_ms = 1000 / one_thread - 1000 / dali_decode_rate
    lines = [f"{name}, 1 thread on 1 core: {one_thread:.1f} images/s = {share:.2f} of decoding alone (target "
             f"{SHARE_OF_DECODE_TARGET}); after the decoder {after_decode_ms:.2f} ms per image"]
    result = {"after_decode_ms": after_decode_ms, "pipeline_1_thread": one_thread, "share_of_decode": share}
    if threads > 1:
        scaling = all_threads / (threads * one_thread)
        result.update(pipeline_threads=threads, pipeline_all_threads=all_threads, scaling=scaling)
        lines.append(f"{name}, {threads} threads: {all_threads:.1f} images/s = {scaling:.2f} of linear (target "
                     f"{SCALING_TARGET})" + ("" if threads < cores else f"; {cores} cores here: the {threads} "
                                             f"threads share them with DALI's executor and the step's thread"))
    return lines, result


def ceiling_summary(decode_rate, dali_decode_rate, for_cpu, for_gpu, threads, cores):
    """The training pipeline as it feeds the CPU's own training and as it feeds a GPU (each (1 thread, all
    threads) images/s; for_gpu None when not timed) against decoding alone, and the cores a GPU needs."""
    lines = [f"decoding alone (OpenCV, 1 thread on 1 core): {decode_rate:.1f} images/s",
             f"DALI's crop-window decoder alone, 1 core: {dali_decode_rate:.1f} images/s"]
    cpu_lines, result = pipeline_summary("dali-cpu training pipeline for the CPU (normalized in the pipeline)",
                                         decode_rate, dali_decode_rate, *for_cpu, threads, cores)
    lines += cpu_lines
    result.update(decode_only=decode_rate, dali_decode_only=dali_decode_rate)
    feeding = for_cpu
    if for_gpu is not None:
        gpu_lines, result["for_gpu"] = pipeline_summary(
            "dali-cpu training pipeline for a GPU (uint8 crops, normalized on the GPU)", decode_rate,
            dali_decode_rate, *for_gpu, threads, cores)
        lines += gpu_lines
        feeding = for_gpu
    if threads == 1:
        lines.append(f"scaling over threads not measured: --threads 1 (give --threads {max(2, cores)})")
    per_core = feeding[0] if threads == 1 else feeding[1] / min(threads, cores)
    result["cores_per_gpu"] = {gpu: math.ceil(rate / per_core) for gpu, rate in GPU_RATES.items()}
    lines.append("cores of this kind to feed one GPU's training: " + ", ".join(
        f"{gpu} ({rate:,} images/s) {result['cores_per_gpu'][gpu]}" for gpu, rate in GPU_RATES.items()))
    return lines, result


def devices_summary(devices, threads_each, rate, one_rate, all_threads_rate, cores):
    """Per-device pipelines against one pipeline with the threads each has (each on a core per thread: up to
    ``devices``x when they run at once) and, when timed, one pipeline with all their threads (1 when they use the
    cores as its threads do)."""
    result = {"devices": devices, "threads_each": threads_each, "images_per_sec": rate, "one_pipeline": one_rate,
              "speedup": rate / one_rate}
    each = f"{threads_each} thread" + "s" * (threads_each > 1)
    line = (f"{devices} per-device pipelines (--kv-store device), {each} each: {rate:.1f} images/s = "
            f"{rate / one_rate:.2f}x one pipeline of {each} (up to {devices}x when they run at once)")
    if all_threads_rate:
        result["of_one_pipeline_all_threads"] = rate / all_threads_rate
        line += f", {rate / all_threads_rate:.2f} of one pipeline of all {devices * threads_each} threads"
    if devices * threads_each > cores:
        line += f"; only {cores} cores here"
    return line, result
